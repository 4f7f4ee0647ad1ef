import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Writes one record per key with the Java client's default partitioner and prints "key partition offset" for each:
 * what the library's producer must agree with. Arguments: brokers, topic, keys...
 */
public class KeyPartitions {
  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    props.put(ProducerConfig.ACKS_CONFIG, "all");
    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
      for (int i = 2; i < args.length; i++) {
        byte[] key = args[i].getBytes(StandardCharsets.UTF_8);
        RecordMetadata metadata = producer.send(new ProducerRecord<>(args[1], key, "java".getBytes(StandardCharsets.UTF_8))).get();
        System.out.println(args[i] + " " + metadata.partition() + " " + metadata.offset());
      }
    }
  }
}
